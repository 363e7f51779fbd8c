// Package models builds Hugging Face decoder-only language models on a backend: it turns a
// config.json into a parameter spec table and a stack of nn layers, loads and saves HF
// checkpoints (config.json + safetensors), initialises weights the way transformers does, runs
// forward/backward over packed micro-batches, and generates with a KV cache: on backends with
// the decoding ops (CUDA) with the cache, the logits and the sampling on the device
// (generate_device.go), elsewhere with a regathered cache and host sampling (generate.go).
//
// A family's structure (which projections carry biases, whether and how queries and keys are
// normalised, which layers are mixtures of experts) is declared once, by its engine/hf/config
// family, and reaches the model code as config.Shape, embedded in Arch. Each HF family is then
// one self-registering file here (llama.go, mistral.go, qwen2.go, qwen3.go, qwen3_moe.go,
// mixtral.go, olmoe.go, flex_olmo.go, granitemoe.go, hunyuan_v1_moe.go, ernie4_5_moe.go, minimax_m2.go, laguna.go, phimoe.go, cohere2_moe.go; the decoders that move or add layer norms, fuse projections, skip RoPE
// on some layers or scale their branches, olmo2, olmo3, phi3, granite, smollm3 and glm4, in
// dense_variants.go; qwen2_moe and glm4_moe, whose layers add shared experts and a
// DeepSeek-style sigmoid router, in moe_shared.go) that declares only what the model code adds: capabilities, the
// tensor-parallel table (Placements: module path -> column, row, replicated or per-head, and
// which modules are routed experts), and for the mixture-of-experts families the Hub weight
// layout of their experts (one tensor per expert, laid out in the arenas so that they are also
// the stacked [E,2I,C] gate_up and [E,C,I] down tensors of the nn.MoE device path) for the
// shared nn.MoE block (moe.go). Such models also carry transformers' load-balancing loss
// (m.AuxLoss, weighted into ForwardBackward's gradient by m.AuxLossScale), per-layer expert
// load metrics (m.ExpertLoad) and optional aux-loss-free bias balancing
// (m.SetExpertBalancing, m.BalanceExperts after each optimizer step). A model can be built
// holding a range of the experts only (Options.Experts): its spec table, arenas, loading and
// WeightTensors cover those experts under their HF names, while its routers still choose
// among every expert by global id (m.HeldExperts, m.ExpertOf); an expert-parallel plan sets
// the runners that reach the other experts.
//
// A family may instead run a decoder of its own (Family.Host, host.go: deepseek_v4, whose
// hyper-connections, compressors and indexer are not Blocks): its parameters sit in the same
// arenas, and each pass runs every document either through the backend's ops, the DeepSeek-V4
// ones of backend.Optional.DSV4 among them (nn.DSV4Device, host_device.go: the parameters stay
// on the device, the LM head is the fused cross-entropy), or on the float64 host tape
// (nn.HostTape: parameters downloaded, gradients added back), as HALO_DSV4_PATH chooses (by
// default the device path on a backend other than the CPU that has the ops, the host tape on
// the CPU backend). It trains under data parallelism and fsdp, without adapters or a classifier
// head, and generates by re-running each row (no KV cache).
//
// Parameters live in one arena per model (gradients in a second) with a named view per
// parameter, derived once from the []ParamSpec table; the optimizer, the gradient norm and
// checkpoints each see one flat buffer.
//
// Entry points:
//
//	m, err := models.Load(dir, b, models.Options{})        // HF checkpoint -> model on backend b
//	m, err := models.New(cfg, b, opts); m.InitRandom(seed) // from a config.json, random init
//	m.ZeroGrads()                                          // start of an optimizer step
//	sum, n, err := m.ForwardBackward(batch, 1/float32(stepTargets)) // grads +=
//	sum, n, err := m.Forward(batch)                        // evaluation
//	lp, err := m.Logprobs(ids)                             // log p(ids[t] | ids[:t])
//	out, err := m.Generate(prompt, models.GenerateOptions{MaxNewTokens: 64})
//	outs, err := m.GenerateBatch(prompts, models.BatchGenerateOptions{...}) // rows decoded together
//	err = m.Save(dir, models.SaveOptions{})                // config.json + safetensors
//
// LoRA (lora.go): m.AttachLoRA(LoRAConfig{...}) puts PEFT-style adapters on the linear layers
// that target_modules selects and freezes the base: from then on m.Grads stays nil and the
// adapters' own arenas (m.LoRA().Specs, Params, Grads) are the only trainable state. Adapters
// save and load in PEFT's format (adapter_config.json + adapter_model.safetensors), fold into
// the base with m.MergeLoRA, and can be switched off per pass (m.SetAdaptersEnabled).
//
// m.Specs, m.Params and m.Grads (one arena each, a view per spec, in the same order) are what an
// optimizer, a gradient norm or a checkpoint of trainer state works on.
//
// The package is not a trainer (see engine/train) and its model code knows nothing about
// parallel layouts: engine/parallel applies them from outside, reading only each family's
// Placements table. It calls only the backend interface, never a backend implementation, so
// every backend runs the same model code.
package models
