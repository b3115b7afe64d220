"""``sweepflow.infra``: standing up the services a run uses. The Python is ``services/`` (Prefect, MLflow, Dask,
S3, PostgreSQL: started, probed, recorded, stopped); ``docker/``, ``k8s/`` and ``docker-compose.yml`` beside it
are the same stack as container images and manifests, not modules."""
