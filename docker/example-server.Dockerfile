# The example Python MCP server (examples/python-server/server.py, official SDK mcp==2.3.0),
# for compose.yaml. It listens on 127.0.0.1:8000 only; the sidecar shares its network
# namespace (network_mode: service:…), as the two containers of a Kubernetes pod do.
#   docker build -f docker/example-server.Dockerfile -t epode-example-server:0.1.0 .
FROM python:3.12-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m pip install "mcp==2.3.0"
COPY examples/python-server/server.py /app/server.py
USER 65532:65532
EXPOSE 8000
# Only the MCP endpoint's TCP port (no HTTP client in the image needed).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000), 2).close()"]
ENTRYPOINT ["python", "/app/server.py"]
CMD ["--port", "8000"]
