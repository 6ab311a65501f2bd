// Confirmation before anything destructive (purge, delete, close). With ``typed`` the user must type
// that text (a queue's name) before Confirm does anything.

export function confirmAction(text, typed = null) {
  const dlg = document.getElementById("confirm");
  const input = document.getElementById("confirm-typed");
  const label = document.getElementById("confirm-typed-label");
  document.getElementById("confirm-text").textContent = text;
  label.hidden = typed === null;
  input.value = "";
  document.getElementById("confirm-typed-hint").textContent = typed === null ? "" : "Type “" + typed + "” to confirm";
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => {
      resolve(dlg.returnValue === "ok" && (typed === null || input.value === typed));
    }, { once: true });
    dlg.returnValue = "";
    dlg.showModal();
    (typed === null ? document.getElementById("confirm-cancel") : input).focus();
  });
}
