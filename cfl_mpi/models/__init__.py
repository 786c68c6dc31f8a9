"""The networks the silos train. Every one has an explicit `embedding` g and `head` h with
`model(x) == head(embedding(x))` (split_model.py): the simple CNN (simple_cnn.py), IFCA's fully
connected network (mlp.py), torchvision's ImageNet models (torchvision_models.py) and a model of
the user's own (own.py). The `model:` section of the config lives in params.py, light enough
for the config check; build.py builds a model and moves its weights to and from the wire."""
