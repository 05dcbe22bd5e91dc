"""``opdispatch serve``: tuned plans served over the Open Inference Protocol (KServe v2).

The protocol, its HTTP/REST (with the binary tensor data extension) and gRPC endpoints, health
and metadata are the ``kserve`` package's ``ModelServer`` (the framework KServe users deploy
and that runs on Ray Serve): :mod:`tuner.serve.server`. What this package adds is the serving of
a plan: :mod:`tuner.serve.repository` reads the models and their settings,
:mod:`tuner.serve.runner` loads each model's stored plan, runs it once before the model is
ready, admits a bounded number of requests, groups requests into batches
(:mod:`tuner.serve.batcher`) and runs them on the plan's streams; :mod:`tuner.serve.metrics`
counts it all for Prometheus; :mod:`tuner.serve.oip_model` is the model class the framework
calls; :mod:`tuner.serve.ray_app` deploys it on Ray Serve.

The framework is an extra (``pip install "opdispatch[serve]"``): nothing here is imported by
``dispatch`` or the rest of the tuner, and :mod:`tuner.serve.repository` and
:mod:`tuner.serve.runner` import no framework.
"""

from __future__ import annotations
