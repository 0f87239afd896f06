"""Tools around the pipeline: synthetic data (``synth``; behaviour events: ``events``; both draw on ``draws``), a
schema and starter pipeline guessed from a sample (``infer``), and what a raw, processed or artifacts directory holds
(``inspect``)."""
