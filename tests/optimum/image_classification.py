"""Run in the optimum test venv (tests/optimum/constraints.txt): `ORTModelForImageClassification.from_pretrained(
folder)` from the folder alone, its own `preprocessor_config.json` preparing a batch of RGB images of any size.
Prints the pixel batch's shape and the logits as JSON on the last line.

    python image_classification.py FOLDER '[[[[r, g, b], ...], ...], ...]'   # images as height x width x 3 bytes
"""

import json
import sys

import numpy as np
from optimum.onnxruntime import ORTModelForImageClassification
from PIL import Image
from transformers import AutoImageProcessor

folder, images = sys.argv[1], json.loads(sys.argv[2])
model = ORTModelForImageClassification.from_pretrained(folder)
processor = AutoImageProcessor.from_pretrained(folder)
pixels = processor([Image.fromarray(np.array(image, dtype=np.uint8)) for image in images], return_tensors="pt")
logits = model(**pixels).logits
print(json.dumps({"shape": list(pixels["pixel_values"].shape), "logits": logits.tolist(),
                  "labels": [model.config.id2label[int(i)] for i in logits.argmax(-1)]}))
