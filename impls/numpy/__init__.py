"""The numpy reference backend: every operator in scope, standard layout, ONNX semantics."""
