"""Run in the optimum test venv (tests/optimum/constraints.txt): `ORTModelForImageClassification.from_pretrained(
folder)` from the folder alone, its own `preprocessor_config.json` preparing a batch of RGB images of any size.
Prints the pixel batch's shape and the logits as JSON, one line per folder (several folders: one start of optimum
for all of them), in the order given.

    python image_classification.py FOLDER '[[[[r, g, b], ...], ...], ...]' [FOLDER ...]   # images: height x width x 3
"""

import json
import sys

import numpy as np
from ending import end_without_teardown  # tests/optimum/ending.py
from optimum.onnxruntime import ORTModelForImageClassification
from PIL import Image
from transformers import AutoImageProcessor

images = json.loads(sys.argv[2])
for folder in [sys.argv[1], *sys.argv[3:]]:
    model = ORTModelForImageClassification.from_pretrained(folder)
    processor = AutoImageProcessor.from_pretrained(folder)
    pixels = processor([Image.fromarray(np.array(image, dtype=np.uint8)) for image in images], return_tensors="pt")
    logits = model(**pixels).logits
    print(json.dumps({"folder": folder, "shape": list(pixels["pixel_values"].shape), "logits": logits.tolist(),
                      "labels": [model.config.id2label[int(i)] for i in logits.argmax(-1)]}))

if __name__ == "__main__":  # several.py runs it too, and ends itself
    end_without_teardown()  # the answer is printed: no interpreter teardown (#48)
