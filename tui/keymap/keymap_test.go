package keymap

import (
	"reflect"
	"testing"

	"charm.land/bubbles/v2/key"
)

// TestEveryBindingHasItsOwnKeysAndHelp checks that no key does two things and that every
// binding shows in the short and the full help.
func TestEveryBindingHasItsOwnKeysAndHelp(t *testing.T) {
	k := Default()
	v := reflect.ValueOf(k)
	owner := map[string]string{}
	inShort, inFull := map[string]bool{}, map[string]bool{}
	for _, b := range k.ShortHelp() {
		inShort[b.Help().Desc] = true
	}
	for _, col := range k.FullHelp() {
		for _, b := range col {
			inFull[b.Help().Desc] = true
		}
	}
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		b := v.Field(i).Interface().(key.Binding)
		if len(b.Keys()) == 0 || b.Help().Key == "" || b.Help().Desc == "" {
			t.Errorf("%s has keys %q and help %+v", name, b.Keys(), b.Help())
		}
		for _, s := range b.Keys() {
			if o, ok := owner[s]; ok {
				t.Errorf("key %q is bound to both %s and %s", s, o, name)
			}
			owner[s] = name
		}
		if !inShort[b.Help().Desc] || !inFull[b.Help().Desc] {
			t.Errorf("%s is missing from the help (short %v, full %v)", name, inShort[b.Help().Desc], inFull[b.Help().Desc])
		}
	}
}
