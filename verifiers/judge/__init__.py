"""Judges: verifiers whose reward comes from a model (an LLM judge or a reward model).

``backend`` is the one interface to a judge model, ``openai_compat`` and ``local`` its
implementations, ``config`` picks one per call, ``templates`` renders fenced prompts and
parses verdicts strictly, ``asking`` retries and types failures; ``rubric``, ``arena`` and
``reward_model`` are the verifiers.
"""
