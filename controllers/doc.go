// Package controllers holds restow's reconcilers. They are plumbing only: get
// the object, call the domain logic in internal/, write status once. The
// migration itself lives in internal/migrator so the CLI can run it too.
package controllers
