package policy

import "testing"

// TestCheckWindowsName: the agent's Windows file layer refuses exactly
// the names the path rules cannot match.
func TestCheckWindowsName(t *testing.T) {
	for _, name := range []string{"a.txt", ".git", "x y", "console.txt", "über"} {
		if err := CheckWindowsName(name); err != nil {
			t.Errorf("CheckWindowsName(%q): %v", name, err)
		}
	}
	for _, name := range []string{"a.txt:s", "x.", "x ", "nul", "COM1.log", "a*", "\xff"} {
		if CheckWindowsName(name) == nil {
			t.Errorf("CheckWindowsName(%q) = nil, want a refusal", name)
		}
		if _, err := parseWinPath(`C:\dir\` + name); err == nil {
			t.Errorf("the path rules match C:\\dir\\%s, which CheckWindowsName refuses", name)
		}
	}
}
