package train

import "fmt"

// datasetFields is DatasetConfig without its UnmarshalYAML, to decode the mapping form.
type datasetFields DatasetConfig

// UnmarshalYAML accepts the mapping form of dataset ({path, format, eval_split, ...}) and
// the shorthand TRL users write, a path or a list of paths: `dataset: train.jsonl` is
// `dataset: {path: train.jsonl}`, the format then inferred from the records as usual.
func (d *DatasetConfig) UnmarshalYAML(unmarshal func(any) error) error {
	var v any
	if err := unmarshal(&v); err != nil {
		return err
	}
	switch v.(type) {
	case map[string]any, nil:
		return unmarshal((*datasetFields)(d))
	case string, []any:
		var p StringList
		if err := unmarshal(&p); err != nil {
			return err
		}
		*d = DatasetConfig{Path: p}
		return nil
	}
	return fmt.Errorf("dataset: want a JSONL path (dataset: train.jsonl), a list of paths, or a mapping such as {path: train.jsonl, eval_split: 0.05}; got %v", v)
}
