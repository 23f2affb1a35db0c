package tasks

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// WrapperFlag, as its first argument, makes the agent's executable the
// wrapper of a background task: see RunWrapper.
const WrapperFlag = "--fleet-task-wrapper"

// RunWrapper runs a background task's wrapper when args, a program's
// arguments with its name first (os.Args), ask for it, and reports
// whether they did. fleet-agent calls it (as agent.RunTaskWrapper) first
// thing in main:
//
//	if code, ok := agent.RunTaskWrapper(os.Args); ok {
//		os.Exit(code)
//	}
//
// The wrapper (PROGRAM --fleet-task-wrapper EXITFILE ARGV...) runs ARGV
// with its own standard files, waits for it, records its exit status in
// EXITFILE, replaced atomically, and exits with it: the task's status
// survives an agent that is not running when the task ends. On Unix a sh
// one-liner does this job; Windows has no sh, so the agent's executable
// does it there.
func RunWrapper(args []string) (int, bool) {
	if len(args) < 2 || args[1] != WrapperFlag {
		return 0, false
	}
	if len(args) < 4 {
		fmt.Fprintln(os.Stderr, "fleet-agent task wrapper: usage: PROGRAM "+WrapperFlag+" EXITFILE COMMAND [ARGS...]")
		return 2, true
	}
	return runWrapped(args[2], args[3:], os.Stdin, os.Stdout, os.Stderr), true
}

// runWrapped runs argv and records its exit status in exitFile.
func runWrapped(exitFile string, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if code = ee.ExitCode(); code < 0 {
			code = 128 + 9 // killed by a signal, as sh reports SIGKILL
		}
	case err != nil:
		fmt.Fprintf(stderr, "fleet-agent task wrapper: %v\n", err)
		code = 127
	}
	if err := writeExitFile(exitFile, code); err != nil {
		fmt.Fprintf(stderr, "fleet-agent task wrapper: recording the exit status: %v\n", err)
	}
	return code
}

// writeExitFile replaces path with the exit status code, atomically.
func writeExitFile(path string, code int) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".exit-*")
	if err != nil {
		return err
	}
	_, err = tmp.WriteString(strconv.Itoa(code) + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
