package main

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/train"
)

// topLevelKeys are the config file's top-level keys, as train.Config declares them.
func topLevelKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if strings.Contains(opts, "inline") {
			keys = append(keys, topLevelKeys(f.Type)...)
			continue
		}
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// The README's table of launch keys names every top-level key of the config.
func TestREADMEListsEveryLaunchKey(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i := strings.Index(s, "| what | keys |")
	if i < 0 {
		t.Fatal("README has no launch key table (| what | keys |)")
	}
	table, _, _ := strings.Cut(s[i:], "\n\n")
	for _, k := range topLevelKeys(reflect.TypeOf(train.Config{})) {
		if !strings.Contains(table, "`"+k+"`") && !strings.Contains(table, "`"+k+":") {
			t.Errorf("the README's launch key table does not name %s", k)
		}
	}
}
