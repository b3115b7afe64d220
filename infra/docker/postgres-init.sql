-- Run once by the postgres image on an empty data directory (mounted into /docker-entrypoint-initdb.d by
-- infra/docker-compose.yml). POSTGRES_DB creates the MLflow database; this adds Prefect's, owned by the
-- same POSTGRES_USER (the user that runs init scripts). MLflow and Prefect create their tables themselves.
CREATE DATABASE prefect;
