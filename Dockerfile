# One image for every stageprof role: migrate, api, ray head, worker.
# GPU workers: build with --build-arg EXTRAS=cuda on a CUDA 12 host.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY store ./store
COPY migrations ./migrations
COPY planner ./planner
COPY workers ./workers
COPY server ./server
COPY client ./client
RUN pip install --upgrade pip \
    && if [ -n "$EXTRAS" ]; then pip install ".[$EXTRAS]"; else pip install .; fi

RUN useradd --create-home stageprof
USER stageprof
EXPOSE 8000
CMD ["stageprof", "serve", "--host", "0.0.0.0", "--port", "8000"]
