package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Rewards of GRPO: a reward function scores every sampled completion of a step. Built-in
// functions are verifiable checks selected by name in the config (reward_funcs); a function
// named "client" is supplied from outside the trainer (Trainer.SetClientReward): the session
// uses it to stream the rollouts to its controlling client, which scores them in a REPL or a
// notebook cell and returns the rewards.

// Rollout is one sampled completion of a prompt, as a reward function sees it.
type Rollout struct {
	// Prompt is the prompt as the model saw it (the chat template applied, for chats).
	Prompt string `json:"prompt"`
	// Question is the last user message of a chat prompt, or the prompt of a
	// prompt/completion record.
	Question string `json:"question"`
	// Completion is the decoded completion, without its stop token.
	Completion string `json:"completion"`
	// Answer is the dataset's reference completion (the final assistant message of a chat,
	// the completion of a prompt/completion record); "" when the dataset has none.
	Answer string `json:"answer"`
	// Group numbers the prompt within the step; the rollouts of one group share a prompt.
	Group int `json:"group"`
	// Truncated is set when the completion reached max_completion_length without a stop
	// token.
	Truncated bool `json:"truncated"`
	// Step is the optimizer step the rollouts are made for (1 for the first).
	Step int `json:"step"`
}

// RewardFunc scores rollouts. Rewards returns one value per rollout, in order; NaN means the
// function has no reward for that rollout (it is left out of the sum and of the function's
// mean, as TRL does with None). An error fails the step (which is then retried or skipped, as
// reward_failure says). Rewards is called on the trainer's goroutine; ctx carries the
// function's timeout.
type RewardFunc interface {
	Name() string
	Rewards(ctx context.Context, rs []Rollout) ([]float64, error)
}

// RewardSpec selects one reward function in the config.
type RewardSpec struct {
	// Name is the function: arithmetic (1 when the completion's last number equals the
	// reference answer's, else 0), format (1 when Pattern matches the whole completion), json
	// (1 when the completion is one valid JSON value), or client (scored by the session's
	// controlling client).
	Name string `yaml:"name" json:"name"`
	// Weight multiplies the function's reward in the sum (TRL's reward_weights). Default 1.
	Weight *float64 `yaml:"weight,omitempty" json:"weight,omitempty"`
	// Pattern is format's regular expression (Go RE2 syntax), matched against the whole
	// completion with surrounding spaces trimmed.
	Pattern string `yaml:"pattern,omitempty" json:"pattern,omitempty"`
}

// RewardNames are the reward functions a config may name.
var RewardNames = []string{"arithmetic", "format", "json", RewardClient}

// RewardClient is the name of the reward function scored outside the trainer.
const RewardClient = "client"

// ErrNoClientReward is returned by a step that needs the client reward function when none is
// attached.
var ErrNoClientReward = errors.New("train: the config names reward function client, but no client scores rollouts: define one in the REPL or a notebook (halo.SetReward) or drop it from reward_funcs")

// builtinReward returns the built-in function of spec (not client).
func builtinReward(spec RewardSpec) (RewardFunc, error) {
	switch spec.Name {
	case "arithmetic":
		return funcReward{"arithmetic", arithmeticReward}, nil
	case "json":
		return funcReward{"json", jsonReward}, nil
	case "format":
		if spec.Pattern == "" {
			return nil, errors.New("reward function format needs a pattern (a regular expression the whole completion must match)")
		}
		re, err := regexp.Compile(`^(?:` + spec.Pattern + `)$`)
		if err != nil {
			return nil, fmt.Errorf("reward function format: pattern %q: %v", spec.Pattern, err)
		}
		return funcReward{"format", func(r Rollout) float64 {
			return b2f(re.MatchString(strings.TrimSpace(r.Completion)))
		}}, nil
	}
	return nil, fmt.Errorf("unknown reward function %q (use one of %s)", spec.Name, strings.Join(RewardNames, ", "))
}

// funcReward is a reward computed rollout by rollout.
type funcReward struct {
	name string
	f    func(Rollout) float64
}

func (f funcReward) Name() string { return f.name }

func (f funcReward) Rewards(ctx context.Context, rs []Rollout) ([]float64, error) {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f.f(r)
	}
	return out, ctx.Err()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var numberRE = regexp.MustCompile(`-?\d+(?:\.\d+)?`)

// lastNumber is the last decimal number in s, if any.
func lastNumber(s string) (float64, bool) {
	all := numberRE.FindAllString(s, -1)
	if len(all) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(all[len(all)-1], 64)
	return v, err == nil
}

// arithmeticReward is 1 when the last number of the completion equals the last number of the
// reference answer, else 0; NaN (no reward) when the reference holds no number.
func arithmeticReward(r Rollout) float64 {
	want, ok := lastNumber(r.Answer)
	if !ok {
		return math.NaN()
	}
	got, ok := lastNumber(r.Completion)
	return b2f(ok && got == want)
}

// jsonReward is 1 when the completion (spaces trimmed) is exactly one valid JSON value.
func jsonReward(r Rollout) float64 {
	s := strings.TrimSpace(r.Completion)
	if s == "" {
		return 0
	}
	dec := json.NewDecoder(strings.NewReader(s))
	var v any
	if dec.Decode(&v) != nil {
		return 0
	}
	_, err := dec.Token()
	return b2f(err == io.EOF) // anything after the value, valid or not, is not one JSON value
}

// SetClientReward supplies the reward function named "client" in reward_funcs (the session
// sets it to the one that asks its controlling client). It is read when a step scores its
// rollouts, on the trainer's goroutine; nil removes it.
func (t *Trainer) SetClientReward(f RewardFunc) { t.clientReward = f }
