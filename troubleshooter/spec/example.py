"""A commented example spec: the starting text of the app's spec editor and of docs/specs.md."""

EXAMPLE_YAML = """\
# A model spec: nothing here is executed. See docs/specs.md for every field.
name: tiny-mlp
model:
  layers:                         # an nn.Sequential of torch.nn layers, by class name
    - Linear: [128, 256]          # positional arguments as a list ...
    - ReLU                        # ... no arguments ...
    - Linear: {in_features: 256, out_features: 10}   # ... or keyword arguments
  # or instead of layers:   preset: gpt   with its parameters beside it (d_model: 256, ...)
# weights: trained.pt             # optional state_dict, loaded with torch.load(weights_only=True)
input:
  shape: [64, 128]                # one batch, batch dimension first
  dtype: float32                  # float32, or int64 with `high: VOCAB` for token ids
  scale: 1.0                      # multiplier on the random input
target: {kind: classes, num_classes: 10}   # classes | regression | none
loss: cross_entropy               # cross_entropy | mse
loss_weight: 1.0                  # multiplier on the loss
optimizer: {name: adamw, lr: 1.0e-3}       # adamw | sgd | adam
"""
