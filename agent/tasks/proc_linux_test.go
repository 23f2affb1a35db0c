package tasks

import (
	"os"
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	line := "4242 (we ird) (name)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 10000 100"
	start, exited, err := parseProcStat([]byte(line))
	if err != nil || start != "987654" || exited {
		t.Fatalf("got %q %v %v", start, exited, err)
	}
	if _, exited, _ := parseProcStat([]byte(strings.Replace(line, ") S ", ") Z ", 1))); !exited {
		t.Fatal("a zombie counts as running")
	}
	for _, bad := range []string{"", "4242 (x S 1", "4242 (x) S 1 2 3"} {
		if _, _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
	if start, exited, err := procIdentity(os.Getpid()); err != nil || exited || start == "" {
		t.Fatalf("own process: %q %v %v", start, exited, err)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 10000 100"))
	f.Fuzz(func(t *testing.T, data []byte) {
		start, _, err := parseProcStat(data)
		if err == nil && strings.ContainsAny(start, " \t\n") {
			t.Fatalf("start time %q", start)
		}
	})
}
