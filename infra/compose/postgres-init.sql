-- The Postgres image creates the `prefect` database (POSTGRES_DB); MLflow gets its own.
CREATE DATABASE mlflow;
