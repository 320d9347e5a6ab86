"""Nightly retuning: the job (request.py: what it runs, checked before it is installed) as a crontab line or a
systemd user timer and service (schedule.py)."""
