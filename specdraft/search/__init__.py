"""`specdraft search`: enumerate layouts of a model and cluster, rank them by estimated step time, verify the best."""
