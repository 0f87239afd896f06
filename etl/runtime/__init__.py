"""How work runs: worker threads (``workers``), a Dask client for ``--cluster`` (``cluster``) and the tasks run on
its workers (``cluster_tasks``), the allocator's tuning (``allocator``), a command's start (``startup``) and progress
callbacks (``progress``)."""
