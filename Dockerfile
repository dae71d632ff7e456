# accelmatrix image: the official Airflow image plus requirements.txt and the accelmatrix
# package. Built by `docker compose build` (docker-compose.yaml, x-airflow-common).
FROM apache/airflow:3.3.2-python3.11

# torch==2.13.0 in requirements.txt resolves to the CPU wheel (2.13.0+cpu) from this index,
# which pip prefers over PyPI's CUDA build of the same version. An *extra* index: every
# other package still comes from PyPI.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# Directories that named volumes are mounted on: a fresh volume copies their ownership,
# so the airflow user (uid 50000) can write artifacts and the auth passwords file.
USER root
RUN mkdir -p /opt/airflow/accelmatrix/artifacts /opt/airflow/auth /opt/airflow/include \
    && chown -R airflow:0 /opt/airflow/accelmatrix /opt/airflow/auth /opt/airflow/include \
    && chmod 0700 /opt/airflow/auth
USER airflow

# Exact pins (apache-airflow==3.3.2 among them, so pip cannot move Airflow itself).
COPY --chown=airflow:0 requirements.txt /tmp/accelmatrix/requirements.txt
RUN pip install --no-cache-dir \
        --extra-index-url "${TORCH_INDEX_URL}" \
        -r /tmp/accelmatrix/requirements.txt

# Install accelmatrix itself so its operators and triggers import from site-packages in
# the workers and the triggerer, not only from the DAG bundle. Its dependencies are all in
# requirements.txt, hence --no-deps.
COPY --chown=airflow:0 pyproject.toml /tmp/accelmatrix/src/pyproject.toml
COPY --chown=airflow:0 plugins/accelmatrix /tmp/accelmatrix/src/plugins/accelmatrix
RUN pip install --no-cache-dir --no-deps /tmp/accelmatrix/src \
    && python -c "import accelmatrix; print('accelmatrix', accelmatrix.__version__)"

# The same sources the compose file bind-mounts, so the image also runs without mounts.
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins
COPY --chown=airflow:0 include /opt/airflow/include

ENV ACCELMATRIX_INCLUDE_DIR=/opt/airflow/include \
    ACCELMATRIX_HOME=/opt/airflow/accelmatrix \
    ACCELMATRIX_ARTIFACTS_DIR=/opt/airflow/accelmatrix/artifacts
