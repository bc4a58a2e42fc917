# One image for every stageprof role: migrate, api, ray head, worker (docker-compose.yml).
# GPU workers: build with --build-arg EXTRAS=cuda (CUDA jax) on a host with NVIDIA GPUs.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY programs ./programs
COPY store ./store
COPY migrations ./migrations
COPY planner ./planner
COPY workers ./workers
COPY server ./server
COPY client ./client
COPY cli ./cli
RUN if [ -n "$EXTRAS" ]; then pip install ".[$EXTRAS]"; else pip install .; fi \
    && rm -rf /src/build

# Run unprivileged from a directory it may write (the default SQLite file lands here).
RUN useradd --create-home stageprof
USER stageprof
WORKDIR /home/stageprof
EXPOSE 8000
CMD ["stageprof", "serve", "--host", "0.0.0.0", "--port", "8000"]
