package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// kind is the JSON shape of a config key.
type kind int

const (
	kInt        kind = iota // integer; *int
	kFloat                  // number; *float64
	kBool                   // true/false; *bool
	kString                 // string; *string
	kOptInt                 // integer or null; **int
	kTokenIDs               // integer, list of integers or null (eos_token_id)
	kIntList                // list of integers; *[]int
	kStringList             // list of strings; *[]string
	kIntMap                 // object of integers; *map[string]int
)

// field maps one config.json key onto a Config field.
type field struct {
	kind kind
	// nullable: null is accepted and means "absent" (the zero value, resolved later) and a zero
	// value is written as null.
	nullable bool
	ptr      func(*Config) any
}

// fields are every family key this package reads; a Family lists the ones it has.
var fields = map[string]field{
	"vocab_size":              {kInt, false, func(c *Config) any { return &c.VocabSize }},
	"hidden_size":             {kInt, false, func(c *Config) any { return &c.HiddenSize }},
	"intermediate_size":       {kInt, false, func(c *Config) any { return &c.IntermediateSize }},
	"num_hidden_layers":       {kInt, false, func(c *Config) any { return &c.NumHiddenLayers }},
	"num_attention_heads":     {kInt, false, func(c *Config) any { return &c.NumAttentionHeads }},
	"num_key_value_heads":     {kInt, true, func(c *Config) any { return &c.NumKeyValueHeads }},
	"head_dim":                {kInt, true, func(c *Config) any { return &c.HeadDim }},
	"hidden_act":              {kString, false, func(c *Config) any { return &c.HiddenAct }},
	"max_position_embeddings": {kInt, false, func(c *Config) any { return &c.MaxPositionEmbeddings }},
	"initializer_range":       {kFloat, false, func(c *Config) any { return &c.InitializerRange }},
	"rms_norm_eps":            {kFloat, false, func(c *Config) any { return &c.RMSNormEps }},
	"use_cache":               {kBool, false, func(c *Config) any { return &c.UseCache }},
	"tie_word_embeddings":     {kBool, false, func(c *Config) any { return &c.TieWordEmbeddings }},
	"attention_bias":          {kBool, false, func(c *Config) any { return &c.AttentionBias }},
	"mlp_bias":                {kBool, false, func(c *Config) any { return &c.MLPBias }},
	"attention_dropout":       {kFloat, false, func(c *Config) any { return &c.AttentionDropout }},
	"pretraining_tp":          {kInt, true, func(c *Config) any { return &c.PretrainingTP }},
	"clip_qkv":                {kFloat, true, func(c *Config) any { return &c.ClipQKV }},
	"bos_token_id":            {kOptInt, true, func(c *Config) any { return &c.BOSTokenID }},
	"pad_token_id":            {kOptInt, true, func(c *Config) any { return &c.PadTokenID }},
	"eos_token_id":            {kTokenIDs, true, nil},
	"sliding_window":          {kInt, true, func(c *Config) any { return &c.SlidingWindow }},
	"use_sliding_window":      {kBool, false, func(c *Config) any { return &c.UseSlidingWindow }},
	"max_window_layers":       {kInt, false, func(c *Config) any { return &c.MaxWindowLayers }},
	"layer_types":             {kStringList, true, func(c *Config) any { return &c.LayerTypes }},
	"num_experts":             {kInt, false, func(c *Config) any { return &c.NumExperts }},
	"num_local_experts":       {kInt, false, func(c *Config) any { return &c.NumExperts }},
	"num_experts_per_tok":     {kInt, false, func(c *Config) any { return &c.NumExpertsPerTok }},
	"moe_intermediate_size":   {kInt, false, func(c *Config) any { return &c.MoEIntermediateSize }},
	"decoder_sparse_step":     {kInt, false, func(c *Config) any { return &c.DecoderSparseStep }},
	"mlp_only_layers":         {kIntList, true, func(c *Config) any { return &c.MLPOnlyLayers }},
	"norm_topk_prob":          {kBool, false, func(c *Config) any { return &c.NormTopKProb }},
	"output_router_logits":    {kBool, false, func(c *Config) any { return &c.OutputRouterLogits }},
	"router_aux_loss_coef":    {kFloat, false, func(c *Config) any { return &c.RouterAuxLossCoef }},
	"router_jitter_noise":     {kFloat, false, func(c *Config) any { return &c.RouterJitterNoise }},
	"input_jitter_noise":      {kFloat, false, func(c *Config) any { return &c.InputJitterNoise }},
	"lm_head_bias":            {kBool, false, func(c *Config) any { return &c.LMHeadBias }},
	// Gemma's keys (gemma.go).
	"hidden_activation":           {kString, false, func(c *Config) any { return &c.HiddenAct }},
	"query_pre_attn_scalar":       {kFloat, false, func(c *Config) any { return &c.QueryPreAttnScalar }},
	"final_logit_softcapping":     {kFloat, true, func(c *Config) any { return &c.FinalLogitSoftcapping }},
	"attn_logit_softcapping":      {kFloat, true, func(c *Config) any { return &c.AttnLogitSoftcapping }},
	"use_bidirectional_attention": {kBool, true, func(c *Config) any { return &c.UseBidirectionalAttention }},
	"sliding_window_pattern":      {kInt, false, func(c *Config) any { return &c.SlidingWindowPattern }},
	"_sliding_window_pattern":     {kInt, false, func(c *Config) any { return &c.SavedSlidingWindowPattern }},
	"cache_implementation":        {kString, true, func(c *Config) any { return &c.CacheImplementation }},
	// gpt_oss's keys (gpt_oss.go).
	"swiglu_limit":           {kFloat, false, func(c *Config) any { return &c.SwigluLimit }},
	"swiglu_alpha":           {kFloat, false, func(c *Config) any { return &c.SwigluAlpha }},
	"experts_per_token":      {kInt, false, func(c *Config) any { return &c.ExpertsPerToken }},
	"initial_context_length": {kInt, false, func(c *Config) any { return &c.InitialContextLength }},
}

// typeError is a key holding the wrong JSON type.
func typeError(key, want string, raw []byte) error {
	return fmt.Errorf("key %q: expected %s, got %s", key, want, jsonKind(raw))
}

func isNull(raw []byte) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// decodeInt reads an integer literal. Python keeps 2.0 a float, which transformers' strict
// config classes refuse for integer fields; so do we.
func decodeInt(key string, raw []byte) (int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || !(raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) {
		return 0, typeError(key, "an integer", raw)
	}
	if !isIntLiteral(string(raw)) {
		return 0, fmt.Errorf("key %q: expected an integer, got %s (write it without a fraction or exponent)", key, raw)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n != int64(int(n)) {
		return 0, fmt.Errorf("key %q: integer %s is out of range", key, truncate(string(raw), 40))
	}
	return int(n), nil
}

// decodeFloat reads a number; isInt reports an integer literal (Python int).
func decodeFloat(key string, raw []byte) (v float64, isInt bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || !(raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) {
		return 0, false, typeError(key, "a number", raw)
	}
	v, err = strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(v, 0) {
		return 0, false, fmt.Errorf("key %q: number %s is out of range", key, truncate(string(raw), 40))
	}
	return v, isIntLiteral(string(raw)), nil
}

func decodeBool(key string, raw []byte) (bool, error) {
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, typeError(key, "true or false", raw)
}

func decodeString(key string, raw []byte) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", typeError(key, "a string", raw)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("key %q: %v", key, err)
	}
	return s, nil
}

// decodeArray splits a JSON array into its raw elements.
func decodeArray(key, want string, raw []byte) ([]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return nil, typeError(key, want, raw)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, fmt.Errorf("key %q: %v", key, err)
	}
	if elems == nil {
		elems = []json.RawMessage{}
	}
	return elems, nil
}

func decodeIntList(key string, raw []byte) ([]int, error) {
	elems, err := decodeArray(key, "a list of integers", raw)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(elems))
	for i, e := range elems {
		if out[i], err = decodeInt(fmt.Sprintf("%s[%d]", key, i), e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func decodeFloatList(key string, raw []byte) ([]float64, error) {
	elems, err := decodeArray(key, "a list of numbers", raw)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(elems))
	for i, e := range elems {
		if out[i], _, err = decodeFloat(fmt.Sprintf("%s[%d]", key, i), e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func decodeStringList(key string, raw []byte) ([]string, error) {
	elems, err := decodeArray(key, "a list of strings", raw)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(elems))
	for i, e := range elems {
		if out[i], err = decodeString(fmt.Sprintf("%s[%d]", key, i), e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func decodeIntMap(key string, raw []byte) (map[string]int, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return nil, typeError(key, "an object of integers", raw)
	}
	var elems map[string]json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, fmt.Errorf("key %q: %v", key, err)
	}
	out := make(map[string]int, len(elems))
	for k, e := range elems {
		v, err := decodeInt(key+"."+k, e)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// setField decodes raw into the field of key on c.
func (c *Config) setField(key string, f field, raw []byte) error {
	if isNull(raw) {
		if !f.nullable {
			return typeError(key, map[kind]string{
				kInt: "an integer", kFloat: "a number", kBool: "true or false", kString: "a string",
			}[f.kind], raw)
		}
		switch f.kind {
		case kInt:
			*f.ptr(c).(*int) = 0
		case kFloat:
			*f.ptr(c).(*float64) = 0
		case kOptInt:
			*f.ptr(c).(**int) = nil
		case kTokenIDs:
			c.EOSTokenIDs, c.eosList = nil, false
		case kIntList:
			*f.ptr(c).(*[]int) = nil
		case kStringList:
			*f.ptr(c).(*[]string) = nil
		case kIntMap:
			*f.ptr(c).(*map[string]int) = nil
		case kString:
			*f.ptr(c).(*string) = ""
		case kBool:
			*f.ptr(c).(*bool) = false
		}
		return nil
	}
	var err error
	switch f.kind {
	case kInt:
		*f.ptr(c).(*int), err = decodeInt(key, raw)
	case kFloat:
		var isInt bool
		*f.ptr(c).(*float64), isInt, err = decodeFloat(key, raw)
		c.intLit[key] = isInt
	case kBool:
		*f.ptr(c).(*bool), err = decodeBool(key, raw)
	case kString:
		*f.ptr(c).(*string), err = decodeString(key, raw)
	case kOptInt:
		var v int
		if v, err = decodeInt(key, raw); err == nil {
			*f.ptr(c).(**int) = &v
		}
	case kTokenIDs:
		t := bytes.TrimSpace(raw)
		if len(t) > 0 && t[0] == '[' {
			c.EOSTokenIDs, err = decodeIntList(key, raw)
			c.eosList = true
		} else {
			var v int
			if v, err = decodeInt(key, raw); err != nil {
				err = typeError(key, "an integer or a list of integers", raw)
			}
			c.EOSTokenIDs, c.eosList = []int{v}, false
		}
	case kIntList:
		*f.ptr(c).(*[]int), err = decodeIntList(key, raw)
	case kStringList:
		*f.ptr(c).(*[]string), err = decodeStringList(key, raw)
	case kIntMap:
		*f.ptr(c).(*map[string]int), err = decodeIntMap(key, raw)
	}
	return err
}

// fieldValue returns the value of key on c as it is written.
func (c *Config) fieldValue(key string) pyValue {
	f, _ := c.Family().field(key)
	switch f.kind {
	case kInt:
		v := *f.ptr(c).(*int)
		if f.nullable && v == 0 {
			return nil
		}
		return intValue(v)
	case kFloat:
		v := *f.ptr(c).(*float64)
		if f.nullable && v == 0 {
			return nil
		}
		return floatValue(v, c.intLit[key])
	case kBool:
		return *f.ptr(c).(*bool)
	case kString:
		v := *f.ptr(c).(*string)
		if f.nullable && v == "" {
			return nil
		}
		return v
	case kOptInt:
		p := *f.ptr(c).(**int)
		if p == nil {
			return nil
		}
		return intValue(*p)
	case kTokenIDs:
		switch {
		case len(c.EOSTokenIDs) == 0 && !c.eosList:
			return nil
		case len(c.EOSTokenIDs) == 1 && !c.eosList:
			return intValue(c.EOSTokenIDs[0])
		}
		out := make([]pyValue, len(c.EOSTokenIDs))
		for i, v := range c.EOSTokenIDs {
			out[i] = intValue(v)
		}
		return out
	case kIntList:
		l := *f.ptr(c).(*[]int)
		if l == nil {
			return nil
		}
		out := make([]pyValue, len(l))
		for i, v := range l {
			out[i] = intValue(v)
		}
		return out
	case kStringList:
		l := *f.ptr(c).(*[]string)
		if l == nil {
			return nil
		}
		out := make([]pyValue, len(l))
		for i, v := range l {
			out[i] = v
		}
		return out
	case kIntMap:
		m := *f.ptr(c).(*map[string]int)
		if m == nil {
			return nil
		}
		out := pyObject{}
		for k, v := range m {
			out[k] = intValue(v)
		}
		return out
	}
	return nil
}
