"""Per-sample trainer protocols (issue #18, item 3): OpenRLHF ``/get_reward``, slime's
``--rm-url`` and NeMo-Gym's ``/verify``, scored like ``/v1/score``.

* :mod:`.config`: ``REWARDD_COMPAT_CONFIG`` (components, label -> reference, group mode,
  per-protocol options), validated when the settings load.
* :mod:`.samples`: the protocols' texts and labels as prompt, completion and reference.
* :mod:`.protocols`: each trainer's request and answer shapes.
* :mod:`.scorer`: the entry: a request's samples scored alone or in groups, as configured.
* :mod:`.scoring`: what both ways share: a sample's outcome, one /v1/rewards call of samples.
* :mod:`.batching`: samples of concurrent requests scored together (without group mode).
* :mod:`.groups`: samples waiting for their group (group mode).
* :mod:`.recording`: the run a request names (``?run_id=&step=``) and its samples recorded.

The routes are in :mod:`rewardd.service.api.compat`.
"""
