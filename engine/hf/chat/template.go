package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/halo-shell/halo-shell/engine/hf/chat/internal/jinja"
)

// ErrNoTemplate is returned (wrapped) when a tokenizer has no chat template: base models often
// have none.
var ErrNoTemplate = errors.New("no chat_template")

// maxConfigBytes bounds what Load reads from tokenizer_config.json or chat_template.jinja.
const maxConfigBytes = 64 << 20

// Template is a checkpoint's chat template(s) together with the special tokens that
// transformers passes to them. It is safe for concurrent use.
type Template struct {
	// Sources maps template names to their Jinja source. A single template is named "default";
	// tokenizer configs with a list of named templates (e.g. "default" and "tool_use") keep
	// their names.
	Sources map[string]string
	// BOS and EOS are the bos_token and eos_token strings ("" when the config has none).
	BOS, EOS string

	specials map[string]jinja.Value
	compiled map[string]*jinja.Template
	origin   string // for error messages: the file the template came from
}

// specialKeys are the special tokens transformers puts in a template's context.
var specialKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// Load reads the chat template of the tokenizer in dir: chat_template.jinja when present
// (newer checkpoints), else the chat_template of tokenizer_config.json; special tokens come
// from tokenizer_config.json.
func Load(dir string) (*Template, error) {
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	cfgData, cfgErr := readLimited(cfgPath)
	jinjaData, jinjaErr := readLimited(jinjaPath)
	if cfgErr != nil && !errors.Is(cfgErr, os.ErrNotExist) {
		return nil, cfgErr
	}
	if jinjaErr != nil && !errors.Is(jinjaErr, os.ErrNotExist) {
		return nil, jinjaErr
	}
	if cfgErr != nil && jinjaErr != nil {
		return nil, fmt.Errorf("chat: %s: %w: neither tokenizer_config.json nor chat_template.jinja is there (%w)", dir, ErrNoTemplate, cfgErr)
	}
	var cfg *config
	if cfgErr == nil {
		var err error
		if cfg, err = parseConfig(cfgData, jinjaErr == nil); err != nil {
			return nil, fmt.Errorf("chat: %s: %w", cfgPath, err)
		}
	} else {
		cfg = &config{specials: map[string]jinja.Value{}}
	}
	origin := cfgPath
	if jinjaErr == nil {
		cfg.sources = map[string]string{"default": string(jinjaData)}
		origin = jinjaPath
	}
	return newTemplate(cfg, origin)
}

// FromConfigJSON builds a Template from the bytes of a tokenizer_config.json.
func FromConfigJSON(data []byte) (*Template, error) {
	cfg, err := parseConfig(data, false)
	if err != nil {
		return nil, fmt.Errorf("chat: tokenizer_config.json: %w", err)
	}
	return newTemplate(cfg, "tokenizer_config.json")
}

// FromSource builds a Template from one Jinja source and the bos/eos token strings ("" for
// none).
func FromSource(src, bos, eos string) (*Template, error) {
	cfg := &config{sources: map[string]string{"default": src}, specials: map[string]jinja.Value{}}
	if bos != "" {
		cfg.specials["bos_token"] = bos
	}
	if eos != "" {
		cfg.specials["eos_token"] = eos
	}
	return newTemplate(cfg, "template")
}

func readLimited(path string) ([]byte, error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		// Opening a named pipe would wait for a writer; a device never ends.
		return nil, fmt.Errorf("chat: %s is not a regular file (%v)", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("chat: %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("chat: %s: larger than %d MiB; this is not a tokenizer config", path, maxConfigBytes>>20)
	}
	return data, nil
}

type config struct {
	sources  map[string]string
	specials map[string]jinja.Value
}

// parseConfig reads the chat template and special tokens of a tokenizer_config.json. When
// templateOptional is set, a missing chat_template is not an error (chat_template.jinja
// provides it).
func parseConfig(data []byte, templateOptional bool) (*config, error) {
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if top == nil {
		return nil, fmt.Errorf("not a JSON object (got null)")
	}
	cfg := &config{sources: map[string]string{}, specials: map[string]jinja.Value{}}
	for _, key := range specialKeys {
		raw, ok := top[key]
		if !ok {
			continue
		}
		s, present, err := tokenString(raw)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		if present {
			cfg.specials[key] = s
		}
	}
	if raw, ok := top["additional_special_tokens"]; ok && !isNull(raw) {
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, fmt.Errorf("key \"additional_special_tokens\": expected a list, got %s", describeJSON(raw))
		}
		list := &jinja.List{}
		for i, it := range items {
			s, present, err := tokenString(it)
			if err != nil {
				return nil, fmt.Errorf("key \"additional_special_tokens\"[%d]: %w", i, err)
			}
			if present {
				list.Items = append(list.Items, s)
			} else {
				list.Items = append(list.Items, nil)
			}
		}
		if len(list.Items) > 0 {
			cfg.specials["additional_special_tokens"] = list
		}
	}
	raw, ok := top["chat_template"]
	if !ok || isNull(raw) {
		if templateOptional {
			return cfg, nil
		}
		return nil, fmt.Errorf("%w: this tokenizer has no chat template (base models often have none); pass a template of your own or add a chat_template.jinja file", ErrNoTemplate)
	}
	var src string
	if err := json.Unmarshal(raw, &src); err == nil {
		cfg.sources["default"] = src
		return cfg, nil
	}
	var named []struct {
		Name     *string `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return nil, fmt.Errorf("key \"chat_template\": expected a string or a list of {\"name\", \"template\"}, got %s", describeJSON(raw))
	}
	for i, n := range named {
		if n.Name == nil || n.Template == nil {
			return nil, fmt.Errorf("key \"chat_template\"[%d]: each named template needs \"name\" and \"template\" strings", i)
		}
		if _, dup := cfg.sources[*n.Name]; dup {
			return nil, fmt.Errorf("key \"chat_template\"[%d]: template name %q appears twice", i, *n.Name)
		}
		cfg.sources[*n.Name] = *n.Template
	}
	if len(cfg.sources) == 0 && !templateOptional {
		return nil, fmt.Errorf("key \"chat_template\": the list of named templates is empty")
	}
	return cfg, nil
}

// tokenString reads a special token: a string, an AddedToken object {"content": ...} or null.
func tokenString(raw json.RawMessage) (string, bool, error) {
	if isNull(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", false, fmt.Errorf("expected a token string or {\"content\": ...}, got %s", describeJSON(raw))
	}
	return *obj.Content, true, nil
}

func newTemplate(cfg *config, origin string) (*Template, error) {
	t := &Template{Sources: cfg.sources, specials: cfg.specials, compiled: map[string]*jinja.Template{}, origin: origin}
	if s, ok := cfg.specials["bos_token"].(string); ok {
		t.BOS = s
	}
	if s, ok := cfg.specials["eos_token"].(string); ok {
		t.EOS = s
	}
	for _, name := range t.Names() {
		c, err := jinja.Compile(cfg.sources[name])
		if err != nil {
			return nil, fmt.Errorf("chat: %s: template %q: %w", origin, name, err)
		}
		t.compiled[name] = c
	}
	return t, nil
}

// Names lists the template names, sorted.
func (t *Template) Names() []string {
	names := make([]string, 0, len(t.Sources))
	for n := range t.Sources {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Options are the arguments of a render besides the messages, as apply_chat_template takes
// them.
type Options struct {
	// AddGenerationPrompt appends the header that opens an assistant turn.
	AddGenerationPrompt bool
	// Tools are tool (function) schemas, usually {"type": "function", "function": {...}}.
	// nil renders with tools=None.
	Tools []json.RawMessage
	// Documents are retrieval documents for templates that take them; nil is None.
	Documents []json.RawMessage
	// Kwargs are further template variables (enable_thinking, date_string, ...). Values are
	// Go values (bool, numbers, strings, slices, maps) or json.RawMessage.
	Kwargs map[string]any
	// TemplateName picks a named template. Empty picks "tool_use" when Tools is set and such a
	// template exists, else "default", else the only template.
	TemplateName string
	// Now is the clock strftime_now reads; nil means time.Now.
	Now func() time.Time
}

// pick chooses the template to render, as transformers does.
func (t *Template) pick(opts *Options) (string, error) {
	if opts.TemplateName != "" {
		if _, ok := t.compiled[opts.TemplateName]; !ok {
			return "", fmt.Errorf("chat: no template named %q; this tokenizer has %v", opts.TemplateName, t.Names())
		}
		return opts.TemplateName, nil
	}
	if opts.Tools != nil {
		if _, ok := t.compiled["tool_use"]; ok {
			return "tool_use", nil
		}
	}
	if _, ok := t.compiled["default"]; ok {
		return "default", nil
	}
	if len(t.compiled) == 1 {
		for n := range t.compiled {
			return n, nil
		}
	}
	return "", fmt.Errorf("chat: this tokenizer has several chat templates %v and none is named \"default\": set Options.TemplateName", t.Names())
}

// messageValues converts messages to the dicts templates see.
func messageValues(msgs []Message) ([]jinja.Value, error) {
	vals := make([]jinja.Value, len(msgs))
	for i := range msgs {
		v, err := msgs[i].value(i)
		if err != nil {
			return nil, fmt.Errorf("chat: %w", err)
		}
		vals[i] = v
	}
	return vals, nil
}

// context builds the variables of a render of the converted messages msgs. Template values
// are immutable (the sandbox forbids mutation), so renders may share them.
func (t *Template) context(msgs []jinja.Value, opts *Options) (map[string]jinja.Value, error) {
	vars := map[string]jinja.Value{}
	for k, v := range t.specials {
		vars[k] = v
	}
	for k, v := range opts.Kwargs {
		if raw, ok := v.(json.RawMessage); ok {
			jv, err := rawValue(raw, fmt.Sprintf("template argument %q", k))
			if err != nil {
				return nil, fmt.Errorf("chat: %w", err)
			}
			vars[k] = jv
			continue
		}
		vars[k] = jinja.FromGo(v)
	}
	vars["messages"] = &jinja.List{Items: msgs[:len(msgs):len(msgs)]}
	raws := func(rs []json.RawMessage, what string) (jinja.Value, error) {
		if rs == nil {
			return nil, nil
		}
		l := &jinja.List{}
		for i, r := range rs {
			v, err := rawValue(r, fmt.Sprintf("%s %d", what, i))
			if err != nil {
				return nil, fmt.Errorf("chat: %w", err)
			}
			l.Items = append(l.Items, v)
		}
		return l, nil
	}
	var err error
	if vars["tools"], err = raws(opts.Tools, "tool"); err != nil {
		return nil, err
	}
	if vars["documents"], err = raws(opts.Documents, "document"); err != nil {
		return nil, err
	}
	vars["add_generation_prompt"] = opts.AddGenerationPrompt
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	vars["strftime_now"] = jinja.StrftimeNow(now)
	return vars, nil
}

// RenderError is a template that failed while rendering, e.g. through raise_exception
// (Kind "TemplateError") or by using a missing value (Kind "UndefinedError").
type RenderError struct {
	Template string // the template's name
	Kind     string // the Python exception jinja2 raises in the same place
	Msg      string
}

func (e *RenderError) Error() string {
	return fmt.Sprintf("chat: rendering template %q: %s: %s", e.Template, e.Kind, e.Msg)
}

// Render renders the conversation as text, exactly as transformers' apply_chat_template
// (tokenize=False) does.
func (t *Template) Render(msgs []Message, opts Options) (string, error) {
	vals, err := messageValues(msgs)
	if err != nil {
		return "", err
	}
	out, _, err := t.render(vals, &opts)
	return out, err
}

func (t *Template) render(msgs []jinja.Value, opts *Options) (string, []jinja.Span, error) {
	name, err := t.pick(opts)
	if err != nil {
		return "", nil, err
	}
	vars, err := t.context(msgs, opts)
	if err != nil {
		return "", nil, err
	}
	out, spans, err := t.compiled[name].Render(vars)
	if err != nil {
		var je *jinja.Error
		if errors.As(err, &je) {
			msg := je.Msg
			if je.Line > 0 {
				msg = fmt.Sprintf("%s (template line %d)", msg, je.Line)
			}
			return "", nil, &RenderError{Template: name, Kind: je.Kind, Msg: msg}
		}
		return "", nil, fmt.Errorf("chat: rendering template %q: %w", name, err)
	}
	return out, spans, nil
}
