"""Output-length prediction: the scheduler's only view of how long a request will run.

The default :class:`OnlinePredictor` keeps, per (tenant, class, prompt-length bucket), an
exponentially weighted mean of observed output lengths, falls back to the (tenant, class),
then the global mean, and caps every prediction by the request's ``max_tokens``.  It records
(predicted, actual) for every finished request and reports its error.
"""

from __future__ import annotations

from ..core.request import Request


class Predictor:
    def predict(self, req: Request) -> int:
        raise NotImplementedError

    def observe(self, req: Request, actual: int) -> None:
        pass

    def report(self) -> dict[str, float]:
        return {}


def _bucket(prompt_tokens: int) -> int:
    return max(0, prompt_tokens.bit_length() - 6)  # <64, <128, <256, ...


class OnlinePredictor(Predictor):
    def __init__(self, prior: float = 256.0, alpha: float = 0.1) -> None:
        self.prior = prior
        self.alpha = alpha
        self._means: dict[tuple[str | int, ...], float] = {}
        self._n_err = 0
        self._abs_err = 0.0
        self._abs_rel_err = 0.0
        self._bias = 0.0

    def _estimate(self, tenant: str, klass: str, bucket: int) -> float:
        m = self._means
        for key in ((tenant, klass, bucket), (tenant, klass), (klass,), ()):
            v = m.get(key)
            if v is not None:
                return v
        return self.prior

    def predict(self, req: Request) -> int:
        est = self._estimate(req.tenant, req.klass, _bucket(req.prompt_tokens))
        return max(1, min(req.max_tokens, int(round(est))))

    def observe(self, req: Request, actual: int) -> None:
        predicted = req.predicted_output
        a = self.alpha
        for key in ((req.tenant, req.klass, _bucket(req.prompt_tokens)), (req.tenant, req.klass), (req.klass,), ()):
            old = self._means.get(key)
            self._means[key] = float(actual) if old is None else old + a * (actual - old)
        err = predicted - actual
        self._n_err += 1
        self._abs_err += abs(err)
        self._abs_rel_err += abs(err) / max(1, actual)
        self._bias += err

    def report(self) -> dict[str, float]:
        n = max(1, self._n_err)
        return {"predictions": self._n_err, "mean_abs_error_tokens": self._abs_err / n,
                "mean_abs_rel_error": self._abs_rel_err / n, "mean_bias_tokens": self._bias / n}
