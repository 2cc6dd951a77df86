"""The LLM twin on the watch's schedule (``servesim calibrate watch --openai``): the
measurements every interval, the fits on a thread of their own (:class:`Rolling`)."""

from __future__ import annotations

import threading
import time

from calibrate.vllm_metrics import Scrape
from calibrate.watch_llm import FitCancelled, LLMTwin


class Rolling:
    """The twin on the watch's schedule: every interval :meth:`row` measures at once, and the
    fits run on a thread of their own, so that a fit longer than the interval (tens of
    seconds where the simulated span is long) never delays the scrapes. The thread always
    fits the newest window it has been given (windows that came while it worked are
    skipped, not queued). A row waits for its own window's fit until ``deadline``; past it,
    the row carries the newest fit that finished (``fit_age_s``: how much older its window
    is than the row's; a note says so)."""

    def __init__(self, twin: LLMTwin):
        self.twin = twin
        self.twin.cancel = threading.Event()
        self._cv = threading.Condition()
        self._pending: dict | None = None  # the newest window not yet taken by the thread
        self._done: tuple[dict, dict] | None = None  # (job, its fit) of the newest fit finished
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _work(self) -> None:
        cancel = self.twin.cancel
        while True:
            with self._cv:
                while self._pending is None and not cancel.is_set():
                    self._cv.wait()
                if cancel.is_set():
                    return
                job, self._pending = self._pending, None
            try:
                fit = self.twin.fit(job)
            except FitCancelled:
                return
            except Exception as err:  # raised again on the watch's thread
                with self._cv:
                    self._error = err
                    self._cv.notify_all()
                continue
            with self._cv:
                self._done = (job, fit)
                self._cv.notify_all()

    def row(self, scrape: Scrape, deadline: float) -> dict | None:
        """The row of the interval that ends with ``scrape``; waits for its window's fit
        until ``deadline`` (``time.monotonic()``)."""
        got = self.twin.measure(scrape)
        if got is None:
            return None
        row, job = got
        if job is None:
            return row
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="servesim-twin-fit", daemon=True)
            self._thread.start()
        with self._cv:
            self._pending = job
            self._cv.notify_all()
            while (self._done is None or self._done[0] is not job) and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            err, self._error = self._error, None
            done = self._done
        if err is not None:
            raise err
        if done is None:
            return {**row, "note": "the first fit is still running"}
        fitted_on, fit = done
        age = round(row["time"] - fitted_on["at"], 3)
        row = {**row, **fit, "fit_age_s": age}
        if age > 0:
            row["note"] = f"predicted on the window of {age:.0f} s ago (a fit takes longer than the interval)"
        return row

    def close(self) -> None:
        """Stop the fit in progress (at its next simulation) and wait for the thread."""
        self.twin.cancel.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
