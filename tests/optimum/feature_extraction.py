"""Run in the optimum test venv (tests/optimum/constraints.txt): a BERT-style ONNX folder loaded alone, twice.

`ORTModelForFeatureExtraction.from_pretrained(folder)` with the folder's own tokenizer on a padded batch of texts,
then `SentenceTransformer(folder, backend="onnx")` (which reads `model.onnx` or `onnx/model.onnx`) on the same texts.
Prints a JSON object on a line: the tokenizer's ids and mask, last_hidden_state, the sentence embeddings,
the sentence-transformers modules and the ONNX file its model session read.

    python feature_extraction.py FOLDER '["a text", "another longer text", "a third"]' [MODEL_FOLDER]

With MODEL_FOLDER, a second JSON line follows: sentence-transformers' torch encoding of the eager model. With a
fourth argument, `[modes_list, hidden_states, attention_mask]` (JSON), one more line per pooling modes: the
`sentence_embedding` sentence-transformers' own `Pooling` computes from those hidden states (one process for both:
each start imports torch and sentence-transformers again).

    python feature_extraction.py FOLDER TEXTS MODEL_FOLDER '[[["cls"], ["mean"]], HIDDEN, MASK]'
"""

import json
import sys

from ending import end_without_teardown  # tests/optimum/ending.py
from optimum.onnxruntime import ORTModelForFeatureExtraction
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

folder, texts = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = ORTModelForFeatureExtraction.from_pretrained(folder)
batch = tokenizer(texts, padding=True, return_tensors="pt")
hidden = model(**batch).last_hidden_state
sentence = SentenceTransformer(folder, backend="onnx", device="cpu", local_files_only=True)
embeddings = sentence.encode(texts, convert_to_numpy=True)
print(json.dumps({"input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"].tolist(),
                  "inputs": sorted(batch), "last_hidden_state": hidden.tolist(),
                  "modules": [type(module).__name__ for module in sentence],
                  "onnx_file": str(sentence[0].auto_model.path), "embeddings": embeddings.tolist()}))
if len(sys.argv) > 3:  # the model folder: sentence-transformers' own eager (torch) encoding, for comparison
    eager = SentenceTransformer(sys.argv[3], device="cpu", local_files_only=True).encode(texts, convert_to_numpy=True)
    print(json.dumps({"eager_embeddings": eager.tolist()}))
if len(sys.argv) > 4:  # pooling modes over given hidden states, as sentence-transformers computes them
    import torch
    from sentence_transformers.models import Pooling

    every, hidden_states, mask = json.loads(sys.argv[4])
    for modes in every:
        pooling = Pooling(len(hidden_states[0][0]), pooling_mode=modes)
        pooled = pooling({"token_embeddings": torch.tensor(hidden_states), "attention_mask": torch.tensor(mask)})
        print(json.dumps({"modes": modes, "sentence_embedding": pooled["sentence_embedding"].tolist()}))

if __name__ == "__main__":  # several.py runs it too, and ends itself
    end_without_teardown()  # the answer is printed: no interpreter teardown (#48)
