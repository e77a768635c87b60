"""A training run's directory, ``storage_path/name``, local or any fsspec URL (s3://).

It holds ``mlflow_run_id.json``, ``checkpoints/``, ``best/``, ``model/`` (the final model,
:data:`~elmo_core.model.serialization.MODEL_DIR`) and ``FINISHED.json``,
each written whole (:class:`~elmo_core.location.Location`), so a run killed at any instant leaves
files a resumed run can trust. A checkpoint on an object store is many objects, which is why
:mod:`pipelines.train.checkpoint` commits it with a marker written after all of its parts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from elmo_core.location import Location
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir

BEST_DIR = "best"  # the model with the best validation perplexity so far
FINISHED_FILE = "FINISHED.json"  # the TrainResult of a finished run
RUN_ID_FILE = "mlflow_run_id.json"  # the run's MLflow run


class RunDirectory(Location):
    """``storage_path/name``: small JSON records, checkpoints and whole model directories."""

    def put_model(self, bilm: BiLM, name: str) -> str:
        """Save ``bilm`` as ``name/`` in the run directory, replacing the previous one."""
        with tempfile.TemporaryDirectory() as staging:
            write_bilm_dir(bilm, staging)
            self.put_directory(Path(staging), name)
        return self.join(name)
