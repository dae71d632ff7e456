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
# The Cloud TPU backend drives the gcloud CLI from the workers and the triggerer (there is
# no Cloud TPU operator in the Google provider). Build with --build-arg INSTALL_GCLOUD=false
# for a deployment without TPU machines.
ARG INSTALL_GCLOUD=true
RUN if [ "$INSTALL_GCLOUD" = "true" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
        && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
            | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
        && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" \
            > /etc/apt/sources.list.d/google-cloud-sdk.list \
        && apt-get update \
        && apt-get install -y --no-install-recommends google-cloud-cli \
        && rm -rf /var/lib/apt/lists/*; \
    fi
RUN mkdir -p /opt/airflow/accelmatrix/artifacts /opt/airflow/accelmatrix/ssh-keys \
        /opt/airflow/auth /opt/airflow/include \
    && chown -R airflow:0 /opt/airflow/accelmatrix /opt/airflow/auth /opt/airflow/include \
    && chmod 0700 /opt/airflow/auth /opt/airflow/accelmatrix/ssh-keys
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
    ACCELMATRIX_ARTIFACTS_DIR=/opt/airflow/accelmatrix/artifacts \
    ACCELMATRIX_KEYS_DIR=/opt/airflow/accelmatrix/ssh-keys
