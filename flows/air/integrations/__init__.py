"""``sweepflow.air.integrations``: Ray AIR's integrations with other tools; here, MLflow (``.mlflow``)."""
