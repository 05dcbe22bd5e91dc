"""The OpenVINO backend: a subgraph backend that runs regions of the graph as models compiled
by OpenVINO's CPU plugin (optional extra: ``pip install 'opdispatch[openvino]'``)."""
