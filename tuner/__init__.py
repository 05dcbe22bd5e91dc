"""The warm-up tuner: candidates, measurements, conversion-aware optimisation, validation and
the SQLite plan store. (Built in a later issue; the package exists so the layout is fixed.)"""
