"""Models: one module each, `build(input_shape, num_classes, **kw) -> keras.Model`."""
