"""The eager model in memory, captured for export: where it comes from, its sample inputs, its components.

```
source.py (folder or Hub repo, the remote-code rule) ──► loading.py (the model loaded, once per run)
   └─► families.py / inputs.py / multimodal.py   the sample inputs of the model's kind (its processor, or a layout)
         └─► components.py (decompose: prefill/decode, vision parts; cache_settings.py: the cache a target asks for)
               └─► shapes.py / probes.py   traced shapes fitted to the target's contract; unseen shapes to probe
                     merged.py: the merged generation graph;  steps.py: feeding one generation step
```

Beside them:

- `loading.py` is apart from `source.py` because it imports the upstream adapter (a process that only reads a
  model folder does not);
- `dtypes.py`: the dtype each target's artifact is written in when the recipe does not say;
- `generation_settings.py`: the repo's `generation_config.json` as shipped, and what it asks of generation;
- `modalities.py`: the modalities (text, images, audio) a model takes, read from its forward and config;
- `llm_runner.py`: which targets get the ExecuTorch LLM runner's layout, and its one component;
- `multimodal_runner.py`: which vision- and audio-language targets get ExecuTorch MultimodalRunner's layout, and its
  three methods;
- `audio_text.py`: an audio-language model's (Voxtral's, Granite Speech's) sample inputs: log-mel features and its
  audio tokens;
- `cross_attention.py`: a vision-language model's whose text layers cross-attend to the image (Mllama) sample inputs
  without its processor;
- `image_text.py`: transformers.js's vision- and audio-language layouts' three graphs;
- `image_text_models.py`: which ONNX targets and models get those layouts (model types, the sample's inputs, the
  recipe's settings), and why not;
- `qwen_vl.py`: Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's vision tower at one image grid, their 3-D (M-RoPE)
  positions and Qwen3-VL's DeepStack features in the features' rows, which transformers.js's layout and ONNX Runtime
  GenAI's Qwen-VL folder trace and feed;
- `asr_runner.py`: which speech targets (a spectrogram or a waveform in) get the ExecuTorch ASR runner's layout, and
  its two components;
- `stepped.py`: the prompt through the decode graph one token at a time (state-space and hybrid models);
- `token_ids.py`: the special token ids a deployment runtime needs beside the graph;
- `attention_size.py`: how large an attention (text, or a vision tower's patches) inputs of given shapes make,
  which probes and `init`'s ranges are held to;
- `chat_prompt.py`: the prompt of one user turn from the repo's chat template, as lines the card's snippets run as
  written and the sample inputs are made by (reads no torch);
- `image_attention.py`: the vision-language models whose prefill attends both ways over the image (Gemma 3,
  PaliGemma), read from a config without torch: what the runtimes' layouts hold or decline.

Imports the recipe, the upstream adapter and the foundation only.
"""
