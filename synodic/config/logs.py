"""Logging helpers for Hydra's job_logging (conf/config.yaml): the CLI prints each error line itself
and logs it for run.log with `extra=FILE_ONLY`, which the terminal handler's filter drops."""
import logging

FILE_ONLY = {"file_only": True}


class TerminalOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)
