"""A training run's directory, ``storage_path/name``, local or any fsspec URL (s3://).

Each file in it is written whole, so a run killed at any instant leaves files a resumed run can
trust.
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
# The training run's tags: where its directory is, its final model, and that it finished.
RUN_DIR_TAG = "elmo.run_dir"
MODEL_DIR_TAG = "elmo.model_dir"
FINISHED_TAG = "elmo.finished"


class RunDirectory(Location):
    """``storage_path/name``: small JSON records, checkpoints and whole model directories."""

    def put_model(self, bilm: BiLM, name: str) -> str:
        """Save ``bilm`` as ``name/`` in the run directory, replacing the previous one."""
        with tempfile.TemporaryDirectory() as staging:
            write_bilm_dir(bilm, staging)
            self.put_directory(Path(staging), name)
        return self.join(name)
