package agent

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
)

// TestHiddenNamesStayNames: the hidden names made after a long name are
// cut without splitting a character, so that they are names Windows can
// hold (and valid UTF-8 everywhere).
func TestHiddenNamesStayNames(t *testing.T) {
	long := strings.Repeat("a", 99) + "ééé.txt"
	for _, n := range []string{hiddenName(long, "tmp", "0123", 1), hiddenName(long, "orig", "0123", 2)} {
		if !utf8.ValidString(n) || safefs.CheckName(n) != nil {
			t.Errorf("hidden name %q: valid UTF-8 %v, %v", n, utf8.ValidString(n), safefs.CheckName(n))
		}
	}
}

// TestPathKeyFolds: with fold (Windows), paths compare as NTFS compares
// names, so a lock, an own-file check or a move cannot be dodged by
// writing a name in another case.
func TestPathKeyFolds(t *testing.T) {
	key := func(p string) string { return pathKey(p, true) }
	if key(`C:\Work\A.txt`) != key(`c:\WORK\a.TXT`) {
		t.Error("keys differ by case")
	}
	if key(`C:\Work\Ä.txt`) != key(`c:\work\ä.TXT`) {
		t.Error("keys differ by the case of a non-ASCII letter")
	}
	if !withinKey(key(`C:\State\Tasks\X`), key(`c:\state`), `\`) || withinKey(key(`C:\Statex`), key(`c:\state`), `\`) {
		t.Error("withinKey is wrong on folded keys")
	}
	if pathKey("/a/B", false) != "/a/B" {
		t.Error("pathKey folds without fold")
	}
}
