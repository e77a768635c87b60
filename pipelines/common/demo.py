"""What the one-command demo (``python -m flows.run_local``) shows at its end: where the MLflow UI
is, and the registered biLM embedding two sentences the way a user's own code would load it."""

from __future__ import annotations

import mlflow
import pandas as pd

from pipelines.common.settings import mlflow_tracking_uri
from pipelines.common.tracking import use_tracking

CHAMPION_URI = "models:/elmo-bilm@champion"
SENTENCES = ("She went to the bank to withdraw money.", "They sat on the bank of the river.")


def sample_embedding(uri: str = CHAMPION_URI) -> str:
    """Load the registered biLM as users do and show the two "bank" vectors of its top layer:
    one word, two contexts."""
    use_tracking()
    model = mlflow.pyfunc.load_model(uri)
    output = model.predict(pd.DataFrame({"sentence": list(SENTENCES)}))
    lines = [f"mlflow.pyfunc.load_model({uri!r}).predict(...):"]
    for tokens, layers in zip(output["tokens"], output["embeddings"], strict=True):
        index = tokens.index("bank")
        top = layers[-1][index]
        shown = ", ".join(f"{value:+.3f}" for value in top[:6])
        lines.append(f"  {' '.join(tokens)}")
        lines.append(f"    'bank', top layer ({len(top)} dims): [{shown}, ...]")
    return "\n".join(lines)


def mlflow_ui_hint() -> str:
    """The MLflow UI's address, or the command that serves it on the embedded store."""
    uri = mlflow_tracking_uri()
    if uri.startswith(("http://", "https://")):
        return f"MLflow UI: {uri}"
    return f"MLflow UI: mlflow ui --backend-store-uri {uri}   (then open http://127.0.0.1:5000)"
