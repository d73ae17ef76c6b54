# The Hub webhook bot's image: the Action's image (the same pinned stack, with bot/) run as a non-root user, the
# web process and one embedded worker in one container, the SQLite job store and the work folders on a volume.
#   docker build -t export-action . \
#     && docker build -f docker/bot.Dockerfile --build-arg ACTION_IMAGE=export-action -t export-bot .
#   docker run -p 7860:7860 -v export-bot-data:/data -e WEBHOOK_SECRET -e HF_TOKEN -e EXPORT_BOT_ALLOWED=my-org export-bot
# As a Hub Docker Space (README metadata `sdk: docker`, `app_port: 7860`, secrets as Space secrets): docs/bot.md.
# Separate workers: run the same image with `--entrypoint /usr/local/bin/python ... -m bot.cli worker` on the same
# volume, and start this one with `--no-worker` (arguments are appended to the entrypoint).
ARG ACTION_IMAGE=ghcr.io/hf/export-action:1
FROM ${ACTION_IMAGE}

# uid 1000: the user Hub Spaces run containers as. It owns /data, where everything the bot writes goes.
RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin bot \
    && mkdir -p /data \
    && chown bot:bot /data
USER 1000:1000
WORKDIR /home/bot

ENV HOME=/home/bot \
    HF_HOME=/data/hf-home \
    EXPORT_BOT_DB=/data/jobs.db \
    EXPORT_BOT_WORK_DIR=/data/work \
    EXPORT_BOT_HOST=0.0.0.0 \
    EXPORT_BOT_PORT=7860

VOLUME ["/data"]
EXPOSE 7860

# The health check asks the served app (GET /healthz: 200 once the job store answers); no curl in the image.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/python", "-m", "bot.cli", "health"]

# Secrets (WEBHOOK_SECRET, HF_TOKEN, EXPORT_BOT_GITHUB_TOKEN) come from the environment, never the image.
ENTRYPOINT ["/usr/local/bin/python", "-m", "bot.cli", "serve"]
