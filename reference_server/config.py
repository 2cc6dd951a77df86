"""What ``servesim serve`` sets: the server's configuration, and how it is shown."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

from reference_server.bodies import BodyLimits
from reference_server.features import FeatureStoreConfig
from reference_server.models import ModelConfig

VERSION = "1"  # the one version of the model this server serves


@dataclass
class ServerConfig:
    """Everything ``servesim serve`` sets."""

    model: ModelConfig = field(default_factory=ModelConfig)
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    max_queue_size: int | None = 256
    instances: int = 1
    frontends: int = 1  # front-end processes (HTTP, decode) in front of the one batcher (reference_server/hub.py)
    threads: int = 1  # torch intra-op threads per instance (CPU)
    features: FeatureStoreConfig | None = None
    max_body_bytes: int = BodyLimits.max_body_bytes
    instance_mode: Literal["process", "thread"] = "process"
    instance_cores: str = "auto"  # auto | none | a core per instance, e.g. "1"
    # an idle instance sleeps on its pipe, or polls it and keeps its core busy (an experiment's
    # lever: calibrate/README, "The light load's batches run slower at the level")
    instance_idle: Literal["sleep", "spin"] = "sleep"
    # inline: decode on the event loop; thread: in a decode thread, which the GIL's 5 ms
    # switch interval makes wait behind the loop (a 28 ms p99 at 20% load on a 16-core host)
    preprocess: Literal["inline", "thread"] = "inline"
    warmup_batches: int = 3
    max_inflight_body_bytes: int = BodyLimits.max_inflight_body_bytes  # request bodies being read at once, all together
    api_key: str | None = None  # a bearer token every route but health checks requires
    body_timeout_s: float = BodyLimits.body_timeout_s  # a request body that sends nothing for this long: 408
    # and the whole body's deadline: body_timeout_s, plus a second per body_min_rate_bps bytes
    # received (Apache's mod_reqtimeout MinRate): a trickle of bytes cannot hold a slot (0: none)
    body_min_rate_bps: float = BodyLimits.body_min_rate_bps

    def body_limits(self) -> BodyLimits:
        """What the front end accepts of request bodies."""
        return BodyLimits(
            self.max_body_bytes, self.max_inflight_body_bytes, self.body_timeout_s, self.body_min_rate_bps
        )


def redact(url: str | None) -> str | None:
    """A URL with its password (and user) replaced, for logs and the config endpoint."""
    if not url or "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    _creds, _, host = rest.rpartition("@")
    return f"{scheme}://***@{host}" if scheme else f"***@{host}"


def features_public(features: FeatureStoreConfig | None) -> dict | None:
    """The feature store's settings with the URL's credentials redacted."""
    if features is None:
        return None
    d = asdict(features)
    d["url"] = redact(d.get("url"))
    return d


def describe(cfg: ServerConfig) -> str:
    """One line for the console: what is served, how."""
    m = cfg.model
    what = f"{m.kind} ({m.resolution}px, width {m.width}, depth {m.depth})" if m.kind == "resnet" else m.kind
    return json.dumps(
        {
            "model": what,
            "precision": m.precision,
            "max_batch_size": cfg.max_batch_size,
            "max_queue_delay_ms": cfg.max_queue_delay_ms,
            "max_queue_size": cfg.max_queue_size,
            "instances": cfg.instances,
            "frontends": cfg.frontends,
            "instance_mode": cfg.instance_mode,
            "instance_cores": cfg.instance_cores,
            "instance_idle": cfg.instance_idle,
            "preprocess": cfg.preprocess,
            "features": features_public(cfg.features),
        }
    )
