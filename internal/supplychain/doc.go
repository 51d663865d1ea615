// Package supplychain holds the tests of what a release publishes about
// itself beside its artifacts (docs/release.md): the SBOMs make sbom and
// make sbom-dist write, and the Sigstore bundles cosign writes when the
// release workflow signs an asset. make test runs them with the Makefile's
// builds of cyclonedx-gomod and cosign (the CYCLONEDX_GOMOD and COSIGN
// variables); without those they skip.
package supplychain
