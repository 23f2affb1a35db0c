package protocol

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The bash tool's per-call arguments that both sides check: the gateway
// describes them to the model and refuses bad ones early, the agent
// enforces them.

const (
	// MaxScriptParameters bounds the named parameters of one call.
	MaxScriptParameters = 64
	// MaxScriptParameterName bounds a parameter's name, in bytes.
	MaxScriptParameterName = 64
	// MaxScriptParametersBytes bounds the parameters' JSON, all together.
	MaxScriptParametersBytes = 1 << 20
	// MaxCwdBytes bounds the cwd argument.
	MaxCwdBytes = 4096
)

// ValidateScriptParameters checks the named parameters of a PowerShell
// script: at most MaxScriptParameters, names that PowerShell binds as
// they are (a letter or "_", then letters, digits and "_"; no two that
// differ only in case, since PowerShell does not tell them apart), and
// JSON values of at most MaxScriptParametersBytes in all.
func ValidateScriptParameters(params map[string]json.RawMessage) error {
	if len(params) > MaxScriptParameters {
		return fmt.Errorf("parameters: %d given, at most %d", len(params), MaxScriptParameters)
	}
	seen := make(map[string]string, len(params))
	size := 0
	for name, v := range params {
		if err := validParamName(name); err != nil {
			return err
		}
		if other, dup := seen[strings.ToLower(name)]; dup {
			return fmt.Errorf("parameters %q and %q differ only in case, and PowerShell reads them as one; keep one", other, name)
		}
		seen[strings.ToLower(name)] = name
		if !json.Valid(v) {
			return fmt.Errorf("parameter %q: its value is not valid JSON", name)
		}
		size += len(name) + len(v)
	}
	if size > MaxScriptParametersBytes {
		return fmt.Errorf("parameters: %d bytes of values, at most %d; put large data in a file and pass its path", size, MaxScriptParametersBytes)
	}
	return nil
}

func validParamName(name string) error {
	if name == "" || len(name) > MaxScriptParameterName {
		return fmt.Errorf("parameter name %q: give 1 to %d characters", name, MaxScriptParameterName)
	}
	for i, r := range name {
		letter := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || r == '_'
		if !letter && (i == 0 || r < '0' || r > '9') {
			return fmt.Errorf("parameter name %q: use a letter or _ first, then letters, digits and _ (as in param($Name))", name)
		}
	}
	return nil
}
