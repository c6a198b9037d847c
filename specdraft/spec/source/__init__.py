"""Layout text and dotlist overrides read as OmegaConf reads them (`text`), with the raw data checked before it
resolves (`checks`)."""
