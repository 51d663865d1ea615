package supplychain_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// repoRoot is the module's root, where the Makefile is.
const repoRoot = "../.."

// tool is the path in the environment variable env, as make test sets it
// to the Makefile's build of a tool; the test fails without it, as the
// control plane's tests do without KUBEBUILDER_ASSETS.
func tool(t *testing.T, env string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set: run the tests with `make test`, which builds the tool into bin/ and sets it", env)
	}
	return path
}

// command runs name in dir with the environment plus env, and returns its
// combined output.
func command(t *testing.T, dir string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
