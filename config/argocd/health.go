// Package argocd holds the Argo CD health check restow ships for
// StorageMigrations (storagemigration-health.lua) and runs it the way Argo
// CD does, so tests can hold it to what kstatus says.
package argocd

import (
	_ "embed"
	"encoding/json"
	"fmt"

	lua "github.com/yuin/gopher-lua"
)

// Script is the health check, as users install it into argocd-cm.
//
//go:embed storagemigration-health.lua
var Script string

// Health runs the health check on an object (any value that marshals to the
// object's JSON) the way Argo CD does: the object is the global obj, and the
// script returns a table with status and message.
func Health(object any) (status, message string, err error) {
	raw, err := json.Marshal(object)
	if err != nil {
		return "", "", err
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", "", err
	}
	state := lua.NewState()
	defer state.Close()
	state.SetGlobal("obj", toLua(state, obj))
	if err := state.DoString(Script); err != nil {
		return "", "", fmt.Errorf("storagemigration-health.lua: %w", err)
	}
	hs, ok := state.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("storagemigration-health.lua returned %s, want a table", state.Get(-1).Type())
	}
	return lua.LVAsString(hs.RawGetString("status")), lua.LVAsString(hs.RawGetString("message")), nil
}

// toLua converts decoded JSON to Lua values, as Argo CD hands objects to its
// health checks: objects and arrays become tables, arrays indexed from 1.
func toLua(state *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := state.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(state, e))
		}
		return t
	case []any:
		t := state.NewTable()
		for _, e := range v {
			t.Append(toLua(state, e))
		}
		return t
	case string:
		return lua.LString(v)
	case float64:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	}
	return lua.LNil
}
