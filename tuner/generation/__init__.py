"""Tuning and measuring text generation (issue 53): the machine's memory bandwidth and the
bound it puts on tokens per second (:mod:`tuner.generation.bandwidth`), and the choice of a
step way for the prompt and for the token steps by measurement. The generation loop itself,
its key/value buffers and its step ways live in :mod:`dispatch.generation`."""
