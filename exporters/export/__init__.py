"""One target to files, in the export child: the upstream config, each component's export, the save.

```
convert.py (a target's upstream config; export each component, one in memory at a time)
   ├─► onnx_files.py        one external-data file for every ONNX component
   ├─► transformers_js.py   the folder transformers.js loads
   ├─► quantize.py          a variant's quantizer
   └─► footprint.py         total and stored weight bytes, read from the files' own structure
```

Beside them:

- `artifact_dtype.py`: the dtype a saved target's files hold, read from their own structure;
- `folder_files.py`: every target folder loads alone (configs, tokenizer and processor files beside its programs);
- `genai_buffer.py`: a `GroupQueryAttention` graph ONNX Runtime GenAI runs on one shared past/present buffer;
- `genai_config.py`: `genai_config.json` beside a merged decoder graph, what ONNX Runtime GenAI reads;
- `llm_runner.py`: a target written in the ExecuTorch LLM runner's layout (`model.pte` and its metadata);
- `multimodal_runner.py`: a vision- or audio-language target written in ExecuTorch MultimodalRunner's layout (one `model.pte`);
- `onnx_names.py`: the merged decoder graph under the names ONNX runtimes bind (optimum, GenAI, transformers.js);
- `seq2seq_merged.py`: one decoder graph for an encoder-decoder export (`decoder_model_merged.onnx`);
- `seq2seq_names.py`: an encoder-decoder generation export in optimum's files and names;
- `shared_graphs.py`: a twin target's saved graphs copied from the first twin's export (`exporters.run.twins`);
- `trace_metadata.py`: the trace's debugging metadata (the exporting machine's source paths) dropped before a save.

A sibling of `validate/`: neither imports the other (validation reads what export wrote, from disk).
"""
