# Build the manager binary and the kubectl plugin. The builder runs on the
# build machine's platform and cross-compiles (CGO_ENABLED=0), so a
# multi-arch build needs no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=v0.1.0-dev
ARG GIT_COMMIT=
WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath -ldflags "-s -w -X github.com/restow/restow/internal/version.Version=${VERSION} -X github.com/restow/restow/internal/version.Commit=${GIT_COMMIT}" -o manager ./cmd/manager
# The kubectl plugin, which the Helm chart's test hook runs.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath -ldflags "-s -w -X github.com/restow/restow/internal/version.Version=${VERSION} -X github.com/restow/restow/internal/version.Commit=${GIT_COMMIT}" -o kubectl-restow ./cmd/kubectl-restow

# distroless: no shell, no package manager, non-root.
FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/manager /workspace/kubectl-restow ./
USER 65532:65532
ENTRYPOINT ["/manager"]
