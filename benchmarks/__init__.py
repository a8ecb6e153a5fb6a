"""Reproducible measurements, with peers side by side in one run; each script's last line is JSON."""
