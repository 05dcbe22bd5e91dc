"""The onnxruntime backend: a subgraph backend that runs regions of the graph in
onnxruntime InferenceSessions (optional extra: ``pip install 'opdispatch[onnxruntime]'``)."""
