"""The context one running request of a job holds, measured, for sizing an engine's batch.

An engine section's `context_tokens` (4,096 unless set) is a guess made before anything ran. Once a job
has done chunks, their headers say what its requests really hold: mean prompt plus mean
output tokens. A job resumed by `fleet run` sizes its engines' batch for that, so that
neither memory sits idle (a short job) nor SGLang keeps retracting requests (a long one).
"""

from __future__ import annotations

import logging

from fleet.monitor.status import JobStatus
from fleet.settings import Settings

log = logging.getLogger(__name__)


def measured_context(status: JobStatus) -> int | None:
    """Mean prompt + output tokens per sample over the done chunks; None before any."""
    if not status.samples_done or not status.completion_tokens:
        return None
    return max(1, round((status.prompt_tokens + status.completion_tokens) / status.samples_done))


def with_job_context(settings: Settings, status: JobStatus) -> Settings:
    """Settings whose engine section's `context_tokens` (the tokens one running request holds, which sizes
    its batch) is the job's measured context, unless the user set it, nothing is done yet or the engine
    sizes no batch by it; says which it uses."""
    name = settings.engine
    section = getattr(settings, name)
    if "context_tokens" not in type(section).model_fields:
        return settings
    if "context_tokens" in section.model_fields_set:
        log.info("job %s: batch sized for %s.context_tokens=%d (set)", status.job, name, section.context_tokens)
        return settings
    measured = measured_context(status)
    if measured is None:
        log.info("job %s: batch sized for %d tokens a request (%s.context_tokens default; nothing "
                 "measured yet)", status.job, section.context_tokens, name)  # fmt: skip
        return settings
    log.info("job %s: batch sized for %d tokens a request, measured over %d done samples",
             status.job, measured, status.samples_done)  # fmt: skip
    return settings.model_copy(update={name: section.model_copy(update={"context_tokens": measured})})
