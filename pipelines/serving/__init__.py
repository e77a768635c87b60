"""The biLM as the platform hands it around: the one loader for every kind of source, and the
MLflow pyfunc models of a biLM and of an adapted task."""
