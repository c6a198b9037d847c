"""One pass of megatron-core's pipeline schedule over a trainer's microbatches, and a whole training pass (the
schedule, the draft off the last stage, the taps' completion, the optimizers): what a cotrain step and a GRPO
update run; a forward-only pass records log-probs."""

from __future__ import annotations

from functools import partial


def schedule_pass(trainer, forward_backward, *, forward_only: bool = False) -> None:
    """One pass of megatron's schedule over the trainer's microbatches (every chunk; forward only for log-probs)."""
    chunk_of = {id(c): i for i, c in enumerate(trainer.chunks)}
    single = len(trainer.chunks) == 1
    iterators = [iter(trainer.microbatches) for _ in trainer.chunks]
    forward_backward(
        forward_step_func=partial(_forward_step, trainer, chunk_of),
        data_iterator=iterators[0] if single else iterators,
        model=trainer.chunks[0] if single else trainer.chunks,
        num_microbatches=trainer.num_microbatches,
        seq_length=trainer.row_tokens,
        micro_batch_size=1,
        forward_only=forward_only,
    )


def run_schedule(trainer, forward_backward) -> None:
    """A training pass, then the draft's and the optimizers' steps: a cotrain step, and a GRPO step's update."""
    schedule_pass(trainer, forward_backward)
    trainer.draft_after_schedule()
    trainer.channel.end_step()
    trainer.optimizer_steps()


def _forward_step(trainer, chunk_of: dict, data_iterator, model):
    mb = next(data_iterator)
    chunk = chunk_of[id(model)]
    trainer.channel.set_microbatch(chunk, mb.index)
    if model.pre_process:
        trainer.put_embedding(model, mb)
    with trainer.measuring("target", mb.index):
        output = model(
            input_ids=mb.tokens[None],
            position_ids=mb.positions[None],
            attention_mask=None,
            packed_seq_params=mb.packed_seq_params(),
        )
    trainer.channel.flush(chunk)  # this microbatch's taps leave as one message per draft rank
    return output, partial(trainer.measured_loss, chunk, mb)
